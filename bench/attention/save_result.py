"""Copy a device run's attention.json into bench/results/attention-<date>.json (date from its meta)."""

from __future__ import annotations

import json
import pathlib
import sys


def main(src: str) -> int:
    doc = json.loads(pathlib.Path(src).read_text())
    stamp = doc["meta"]["date_utc"].replace(":", "").replace("+0000", "Z")
    dst = pathlib.Path(__file__).resolve().parents[1] / "results" / f"attention-{stamp}.json"
    dst.write_text(json.dumps(doc, indent=1) + "\n")
    print(dst)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
