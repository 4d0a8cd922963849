"""What a command asks of the planners, above them and below :mod:`autoplan.api`:
``request.py`` builds a training search's request (job file + options, every problem at
once), ``check.py`` is the CI gate for a committed plan, ``diff.py`` what changed between
two plans. Each reads several planners (search, serving, export, what-if, the runs log),
so none of those may import it."""
