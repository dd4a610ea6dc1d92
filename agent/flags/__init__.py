"""The command line's grammar: every command's flags, their ``TOPOLOGY_<NAME>`` fallbacks, their checks, and the
settings they give.

One module per command, named as the command (``init``, ``sidecar``, ``render``, ``explain``, ``inject``,
``webhook``, ``keygen``, ``sandbox``, ``demo``), each with ``add_arguments(parser)`` and ``settings_from(args)``;
what several share is in ``common`` (the knobs, the value checks, the topology and SSH options) and ``pod`` (what
init and the sidecar share: the in-cluster flags and the pod's start). ``parser`` lists the commands with their
help lines, reads a command's module only when that command runs (a pod's init reads 4 of these modules), and
checks a whole command line (``check_command_line``: inject and the webhook check every command line they write
with it).

The layer sits below the runtime, which imports the checker from here, and imports no runtime module: where a
runtime type holds a command's settings (``InitSettings``, ``SidecarSettings``, ``WebhookSettings``), the command's
module gives that type's fields by their names there, checked (a TypedDict that mypy holds to the type), and
``cli.py`` passes them on whole. A new flag is its argument and its value here, plus the field it feeds.
"""
