"""``python -m vit_plugin.ops``: where mmcv's operators come from, checked by running them.

    python -m vit_plugin.ops                 # source + NMS / RoIAlign once on the CPU and each visible GPU
    python -m vit_plugin.ops install-hook    # write the start-up .pth into this interpreter's site-packages
"""
import argparse
import sys

from vit_plugin import ops


def main(argv=None):
    parser = argparse.ArgumentParser(prog='python -m vit_plugin.ops', description=__doc__.splitlines()[0])
    parser.add_argument('command', nargs='?', default='check', choices=['check', 'install-hook'])
    parser.add_argument('--site-dir', help='install-hook: the site-packages folder (default: this interpreter\'s)')
    args = parser.parse_args(argv)
    if args.command == 'install-hook':
        print(f'wrote {ops.install_startup_hook(args.site_dir)}')
        return 0
    try:
        print(f'mmcv ops: {ops.check()}')
    except RuntimeError as error:
        print(f'error: {error}', file=sys.stderr)
        return 1
    return 0


if __name__ == '__main__':
    sys.exit(main())
