"""One module per load scenario; each exposes a click ``command`` and its role functions.

Role functions (``producer``, ``consumer`` …) take a ``runner.ClientContext`` and run one
client connection to completion; they are named in ``runner.ClientSpec`` as
``"kestrel_actors.loadtests.scenarios.<module>:<function>"`` so worker processes can import them.
"""

__all__: list[str] = []
