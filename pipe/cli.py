"""What every command-line program of pipe answers to a bad value: one line that names the
value and the fix, and exit code 2. (argparse prints its whole usage first.)"""
import argparse
import os
import sys

from pipe.config import as_flags

__all__ = ["Parser", "positive_int", "existing_file", "run"]


class Parser(argparse.ArgumentParser):
    def error(self, message):
        print(f"error: {message}", file=sys.stderr)
        sys.exit(2)


def positive_int(text):
    """An integer flag that must be at least 1, with the value echoed when it is not."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def existing_file(text):
    """A path flag that must name a file, with the path echoed when it does not."""
    if not os.path.isfile(text):
        raise argparse.ArgumentTypeError(f"no such file: {text}")
    return text


def run(main):
    """Run a program's `main()`: a value the library refuses (ValueError, TypeError) is
    told in one line, with the config fields it names shown as the program's flags."""
    try:
        main()
    except (ValueError, TypeError) as e:
        print(f"error: {as_flags(str(e))}", file=sys.stderr)
        sys.exit(2)
