"""Where a benchmark's result goes: the JSON file named by its ``--out``."""
import json

from vit_plugin.engine.checkpointing import atomic_write_bytes


def write_result(result: dict, path: str, indent: int = 1) -> None:
    """Writes ``result`` as JSON to ``path`` (its folder made), whole or not at all."""
    atomic_write_bytes(json.dumps(result, indent=indent).encode(), path)
