"""The ``juggler`` command line: one module per subcommand.

Each ``cli/<name>.py`` defines ``register(subparsers)``, which adds its parser
and sets ``func`` to a callable taking the parsed namespace and returning an
exit code. Heavy imports happen inside those callables, so ``juggler --help``
stays fast. ``main.py`` wires them together.
"""
