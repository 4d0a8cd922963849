"""Engine release versions as the engines and NVIDIA Dynamo spell them, put in order.

:func:`parse_version` reads the spellings the serving engines publish and the measured runs
record: ``0.19.0``, ``v0.19.0``, ``1.3.0rc5``, ``1.2.0rc6.post2``, ``0.8.1.post1``,
``1.1.0-dev.2``, ``0.5.1-rc0.pre1`` (a pre-release of rc0), ``0.19.0+cu130`` (a local
build tag, ignored) and nightly builds (``nightly``, ``nightly-dev-20260216-d3bae71e``,
``nightly-5b8c30d6``: newer than every release). The order is PEP 440's (packaging.version):
a development release before the alpha, beta and release candidates of its release, they
before the release, the release before its post-releases; a ``.preN`` after a candidate
before the candidate itself (Dynamo's ``0.5.1-rc0.pre1`` comes before ``0.5.1-rc0``).

NVIDIA Dynamo's runtime containers carry Dynamo's version, not the engine's: a measured
run that names ``nvcr.io/nvidia/ai-dynamo/tensorrtllm-runtime:0.8.1.post2`` ran
TensorRT-LLM 1.2.0rc6.post2. :func:`dynamo_engine_version` maps one to the other from
Dynamo's published support matrix (:data:`DYNAMO`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

MAX_VERSION_CHARS = 80  # longer text is no version (a nightly tag with its hash is ~40)

# a release: up to four numbers (0.19.0, 1.3.0, 0.5.9, 2024.1.2.3)
_RELEASE = re.compile(r"v?(\d{1,6})(?:\.(\d{1,6}))?(?:\.(\d{1,6}))?(?:\.(\d{1,6}))?")
# what may follow it: qualifiers, each with its number (separators optional)
_QUALIFIER = re.compile(r"[.\-_]?(rc|c|alpha|a|beta|b|preview|pre|dev|post)(?![a-z])[.\-_]?(\d{0,9})")
# pre-release phases, in order (PEP 440: a < b < rc; "c", "pre", "preview" spell rc)
_PHASE = {"dev": 0, "alpha": 1, "a": 1, "beta": 2, "b": 2, "rc": 3, "c": 3, "pre": 3, "preview": 3}
_FINAL = 9  # the release itself: after every pre-release phase
EXAMPLES = "'0.19.0', '1.3.0rc5' or '1.2.0rc6.post2'"


class VersionError(ValueError):
    """Text that is no engine version (the plan reader and the CLI name the field)."""


@dataclass(frozen=True, slots=True, order=True)
class Version:
    """A parsed version; compares in release order (module doc). ``text`` as given."""

    key: tuple[int, ...]
    text: str = field(compare=False)

    @property
    def nightly(self) -> bool:
        return self.key[0] == NIGHTLY_KEY[0]

    def __str__(self) -> str:
        return self.text


NIGHTLY_KEY = (1 << 30,)  # above any release


def parse_version(text: object) -> Version:
    """The version ``text`` spells (module doc), or :class:`VersionError` saying why not."""
    if not isinstance(text, str):
        raise VersionError(f"expected a version as text such as '0.19.0', got {text!r}"
                           + (" (YAML reads an unquoted 0.10 as the number 0.1: quote it)"
                              if isinstance(text, (int, float)) and not isinstance(text, bool) else ""))
    raw = text.strip()
    if not raw or len(raw) > MAX_VERSION_CHARS:
        raise VersionError(f"expected a version such as '0.19.0', got {text[:MAX_VERSION_CHARS]!r}")
    low = raw.lower()
    if low == "nightly" or low.startswith(("nightly-", "nightly_")):
        return Version(NIGHTLY_KEY, raw)
    head, _, _local = low.partition("+")  # a local build tag (+cu130) names the same release
    m = _RELEASE.match(head)
    if m is None:
        raise VersionError(f"expected a version such as {EXAMPLES}, got {raw!r}")
    release = tuple(int(g) if g is not None else 0 for g in m.groups())
    # pre: (phase, number, sub-phase, sub-number): a release is (_FINAL, 0, 0, 0); rcN is
    # (3, N, 0, 0); rcN.preM (a pre-release of the candidate) is (3, N, -1, M), before rcN
    pre = (_FINAL, 0, 0, 0)
    post = -1
    rest, at = head, m.end()
    seen_pre = False
    while at < len(rest):
        q = _QUALIFIER.match(rest, at)
        if q is None or q.end() == at:
            raise VersionError(f"expected a version such as {EXAMPLES}, got {raw!r} (cannot read "
                               f"{rest[at:]!r})")
        word, digits = q.group(1), q.group(2)
        n = int(digits) if digits else 0
        if word == "post":
            if post >= 0:
                raise VersionError(f"{raw!r}: two post-release numbers")
            post = n
        elif not seen_pre and post < 0:
            pre = (_PHASE[word], n, 0, 0)
            seen_pre = True
        elif seen_pre and word in ("pre", "dev") and pre[2] == 0 and post < 0:
            pre = (pre[0], pre[1], -1, n)  # a pre-release of the candidate before it
        else:
            raise VersionError(f"{raw!r}: the qualifier {word!r} cannot follow what comes before it")
        at = q.end()
    return Version((*release, *pre, post), raw)


# -- NVIDIA Dynamo's runtime containers --------------------------------------------------

# Dynamo release -> the engine versions its runtime containers hold, from Dynamo's support
# matrix (github.com/ai-dynamo/dynamo docs/reference/support-matrix.md, "Backend
# Dependencies", at commit 00552b2), and for 0.5.1 its GPT-OSS-120B GB200 recipe ("TensorRT-LLM
# 1.1.0rc2.post2, uses image tensorrtllm-runtime:0.5.1-rc0.pre3"). None: not published.
DYNAMO: dict[str, dict[str, str | None]] = {
    "0.5.1-rc0.pre3": {"trtllm": "1.1.0rc2.post2", "vllm": None, "sglang": None},
    "0.6.0": {"sglang": "0.5.3.post2", "trtllm": "1.1.0rc5", "vllm": "0.11.0"},
    "0.7.0": {"sglang": "0.5.4.post3", "trtllm": "1.2.0rc2", "vllm": "0.11.0"},
    "0.7.0.post1": {"sglang": "0.5.4.post3", "trtllm": "1.2.0rc3", "vllm": "0.11.0"},
    "0.7.1": {"sglang": "0.5.4.post3", "trtllm": "1.2.0rc3", "vllm": "0.11.0"},
    "0.8.0": {"sglang": "0.5.6.post2", "trtllm": "1.2.0rc6.post1", "vllm": "0.12.0"},
    "0.8.1.post2": {"sglang": "0.5.6.post2", "trtllm": "1.2.0rc6.post2", "vllm": "0.12.0"},
    "0.8.1.post3": {"sglang": "0.5.6.post2", "trtllm": "1.2.0rc6.post3", "vllm": "0.12.0"},
    "0.9.0": {"sglang": "0.5.8", "trtllm": "1.3.0rc1", "vllm": "0.14.1"},
    "0.9.1": {"sglang": "0.5.8", "trtllm": "1.3.0rc3", "vllm": "0.14.1"},
    "1.0.0": {"sglang": "0.5.9", "trtllm": "1.3.0rc5.post1", "vllm": "0.16.0"},
    "1.1.0-dev.1": {"sglang": "0.5.9", "trtllm": "1.3.0rc5.post1", "vllm": "0.17.1"},
    "1.1.0-dev.2": {"sglang": "0.5.9", "trtllm": "1.3.0rc9", "vllm": "0.19.0"},
    "1.1.0-dev.3": {"sglang": "0.5.10.post1", "trtllm": "1.3.0rc11", "vllm": "0.19.0"},
    "1.1.0": {"sglang": "0.5.10.post1", "trtllm": "1.3.0rc11", "vllm": "0.19.0"},
}
# Dynamo releases the matrix lists with the same engines as an earlier row: 0.6.1,
# 0.6.1.post1 as 0.6.0; 0.8.1, 0.8.1.post1 as 0.8.0; 1.0.1, 1.0.2 as 1.0.0; 1.1.1 as 1.1.0.
# :func:`dynamo_engine_version` takes the newest row at or before the version asked.
_DYNAMO_ROWS = sorted((parse_version(v), row) for v, row in DYNAMO.items())


def dynamo_engine_version(engine: str, dynamo_version: str) -> str | None:
    """The ``engine`` release (``vllm``, ``sglang``, ``trtllm``) inside NVIDIA Dynamo's
    runtime container ``dynamo_version`` (its image tag): the newest :data:`DYNAMO` row at or
    before it; None where that row does not name the engine or the version precedes them
    all. A measured run's version is Dynamo's where its image is
    ``nvcr.io/nvidia/ai-dynamo/<engine>-runtime:<the same text>``."""
    asked = parse_version(dynamo_version)
    found = None
    for v, row in _DYNAMO_ROWS:
        if v <= asked:
            found = row
    return None if found is None else found.get(engine)
