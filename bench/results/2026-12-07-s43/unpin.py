"""Session 43's A/B on the device: undo the telemetry pin in this copy of the tree, so the second run times the
epilogues as they were before it (4a5cf67): each call of gluon_q8.add_subtile_telemetry becomes the two in-place
sums it replaced. Run from the repository root; `python3 unpin.py restore` puts the files back."""
import re
import shutil
import sys
from pathlib import Path

FILES = [Path("kernels/gluon_q8.py"), Path("kernels/gluon_f32.py")]
CALL = re.compile(r"^( *)sq, bad = (?:_q8\.)?add_subtile_telemetry\(sq, bad, sq_j, bad_j\)$", re.M)

if sys.argv[1:] == ["restore"]:
    for f in FILES:
        shutil.move(f"/tmp/{f.name}.pinned", f)
    sys.exit(0)
for f in FILES:
    text = f.read_text()
    shutil.copy(f, f"/tmp/{f.name}.pinned")
    text, n = CALL.subn(r"\1sq += sq_j\n\1bad += bad_j", text)
    assert n == 1, (f, n)
    f.write_text(text)
    print(f"{f}: the pin undone at its call")
