import subprocess
import sys


def test_core_imports_no_torch():
    code = (
        "import sys, pkgutil, importlib, pdserve.core as c\n"
        "for m in pkgutil.iter_modules(c.__path__): importlib.import_module('pdserve.core.' + m.name)\n"
        "bad = [m for m in sys.modules if m == 'torch' or m.startswith('torch.')]\n"
        "assert not bad, bad\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr
