"""placeholder"""
def add_parser(subparsers):
    pass
