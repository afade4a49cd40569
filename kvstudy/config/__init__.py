"""Configuration: every key's type and bounds (``schema.py``), the checks of a composed config and of command-line
overrides before anything runs (``validate.py``, ``cli_overrides.py``). A bad value is one ``error:`` line naming the
key and what is allowed."""
