"""One module per command, each registering it on the one ``app``
(:mod:`autoplan.cli.app`); :mod:`autoplan.cli.main` imports them all."""
