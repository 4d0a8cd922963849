"""A check's report as text for a CI log and as JUnit XML for a CI's test reports
(``autoplan check --format text|junit``; :func:`autoplan.api.check`'s ``to_text`` and
``to_junit``), and the few words a plan is named by in them."""

from __future__ import annotations

from typing import TYPE_CHECKING

from autoplan.api._base import layout_text
from autoplan.text import printable

if TYPE_CHECKING:
    from autoplan.commands.check import CheckReport, RuleResult
    from autoplan.plan import Plan


def cluster_text(plan: Plan) -> str:
    """What the plan runs on: ``32 x h100-sxm (dgx-h100)``, or across pools each pool's
    GPUs the plan uses (``h100-a100: ampere 32 x a100-80gb, hopper 32 x h100-sxm``)."""
    if plan.placement is None:
        return f"{plan.cluster.gpus} x {plan.cluster.device.name} ({plan.cluster.name})"
    placement, lay = plan.placement, plan.layout
    block = lay.dp * lay.tp * lay.cp
    used = dict.fromkeys(placement.stage_pools)  # in pipeline order
    return f"{placement.cluster.name}: " + ", ".join(
        f"{pool.name} {block * placement.stages_on(i)} x {pool.device.name}"
        for i, pool in ((i, placement.cluster.pools[i]) for i in used))


CHECK_SUITE = "autoplan check"  # the JUnit testsuite's name


def plan_words(plan: Plan) -> str:
    """A plan in a few words: layout, micro-batch, schedule, recompute, ZeRO, sp."""
    return (f"{layout_text(plan)}, micro_batch {plan.micro_batch}, {plan.schedule.value}, "
            f"recompute {plan.recompute_label}, zero {int(plan.zero)}"
            + (", sp" if plan.sequence_parallel else ""))


def check_message(report: CheckReport, result: RuleResult) -> str:
    """A rule's one-line message; the regression rule names the best plan."""
    from autoplan.commands.check import Rule

    reg = report.regression
    if result.rule is Rule.REGRESSION and reg is not None and reg.best is not None:
        return f"{result.message} (best: {plan_words(reg.best.plan)})"
    return result.message


def check_text(report: CheckReport) -> str:
    """The check for a CI log: what was checked, one line per rule, the verdict. Plain
    text (names come from user files), the same bytes for the same input."""
    from autoplan.commands.check import Status

    marks = {Status.PASSED: "PASS", Status.FAILED: "FAIL", Status.ERROR: "ERROR",
             Status.SKIPPED: "SKIP"}
    plan = report.plan
    head = report.source
    if plan is not None:
        head += f": {plan.model.name} on {cluster_text(plan)}, {plan_words(plan)}"
    elif report.summary:
        head += f": {report.summary}"
    lines = [head]
    width = max(len(r.rule.value) for r in report.rules)
    for r in report.rules:
        lines.append(f"  {marks[r.status]:<5} {r.rule.value:<{width}}  {check_message(report, r)}")
        lines.extend(f"  {'':<5} {'':<{width}}    {d}" for d in r.details)
    if report.bad_input:
        lines.append("check: bad input (exit 2)")
    elif report.passed:
        lines.append(f"check passed: {len(report.rules)} rules")
    else:
        failed = ", ".join(r.rule.value for r in report.failed)
        lines.append(f"check failed: {len(report.failed)} of {len(report.rules)} rules ({failed})")
    return printable("\n".join(lines)) + "\n"  # a path may hold an escape sequence


def check_junit(report: CheckReport) -> str:
    """JUnit XML as CI systems render it: one testsuite "autoplan check", one testcase per
    rule, ``<failure>`` for a failed rule, ``<error>`` for bad input, ``<skipped>`` for a
    rule not evaluated. No times: the same bytes for the same input."""
    import xml.etree.ElementTree as ET

    from autoplan.commands.check import Status

    # a path, a name or a runs log's time may hold what XML cannot, or what a CI page would
    # render as other than it is spelled (a bidi override, a line separator): shown as escapes
    from autoplan.text import report_safe as x

    counts = {s: sum(r.status is s for r in report.rules) for s in Status}
    attrs = {"tests": str(len(report.rules)), "failures": str(counts[Status.FAILED]),
             "errors": str(counts[Status.ERROR]), "skipped": str(counts[Status.SKIPPED])}
    root = ET.Element("testsuites", {"name": "autoplan", **attrs})
    suite = ET.SubElement(root, "testsuite", {"name": CHECK_SUITE, **attrs})
    props = ET.SubElement(suite, "properties")
    ET.SubElement(props, "property", {"name": "plan", "value": x(report.source)})
    if report.regression is not None:
        ET.SubElement(props, "property", {"name": "space", "value": x(report.regression.space)})
        ET.SubElement(props, "property", {"name": "max_regression",
                                          "value": repr(report.regression.max_regression)})
    for r in report.rules:
        case = ET.SubElement(suite, "testcase", {"classname": x(report.source), "name": r.rule.value})
        message = x(check_message(report, r))
        text = x("\n".join((message, *r.details)))
        if r.status is Status.FAILED:
            ET.SubElement(case, "failure", {"message": message, "type": r.rule.value}).text = text
        elif r.status is Status.ERROR:
            ET.SubElement(case, "error", {"message": message, "type": "bad input"}).text = text
        elif r.status is Status.SKIPPED:
            ET.SubElement(case, "skipped", {"message": message})
        else:
            ET.SubElement(case, "system-out").text = text
    ET.indent(root)
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"
