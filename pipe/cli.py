"""What every command-line program of pipe answers to a bad value: one line that names the
value and the fix, and exit code 2. (argparse prints its whole usage first.)"""
import argparse
import sys

__all__ = ["Parser", "positive_int"]


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
