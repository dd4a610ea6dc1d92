"""The command line's grammar: every command's flags, their ``TOPOLOGY_<NAME>`` fallbacks, their checks, and the
settings they give.

One module per command, named as the command (``init``, ``sidecar``, ``render``, ``explain``, ``inject``,
``webhook``, ``keygen``, ``sandbox``, ``demo``), each with ``add_arguments(parser)`` and ``settings_from(args)``;
what several share is in ``common`` (the knobs, the value checks, the topology and SSH options) and ``pod`` (what
init and the sidecar share: the in-cluster flags and the pod's start). ``parser`` lists the commands with their
help lines, reads a command's module only when that command runs (a pod's init reads 4 of these modules), and
checks a whole command line (``check_command_line``: inject and the webhook check every command line they write
with it).

The layer sits below the runtime, which imports the checker and the settings types from here, and imports no
runtime module. A command's settings type lives in its module (``init.InitSettings``, ``sidecar.SidecarSettings``):
the fields its own flags give, each with its one default, form a base (``InitOwn``, ``SidecarOwn``) that the check
fills, and the settings add the pod's fields to it. A new flag is its argument, its field and its check in its
command's module, plus its use.
"""
