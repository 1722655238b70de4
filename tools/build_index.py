"""Build the index of a config's tar-shard datasets once, ahead of training (docs/data.md#the-index).

    python tools/build_index.py CONFIG [--val] [--workers N] [--cfg-options key=value ...]

Progress goes to the log with the time left; a stopped build continues where it stopped when the
command runs again. The code is :mod:`vit_plugin.cli.build_index`.
"""
from vit_plugin.cli.build_index import main
from vit_plugin.cli.launch import run_as_script

if __name__ == '__main__':
    run_as_script(main)
