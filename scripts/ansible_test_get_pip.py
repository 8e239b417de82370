"""pip bootstrap for ansible-test's sanity virtual environments, built from PyPI's pip wheel.

ansible-test bootstraps pip into each virtual environment it creates with a ``get-pip`` script that it
downloads from ci-files.testing.ansible.com, a host this project's machines cannot reach. It looks for that
script in ``~/.ansible/test/cache/get_pip_<version>.py`` first. scripts/setup-python.sh places this file
there, next to the matching pip wheel downloaded from PyPI. Like the real get-pip, it runs
``pip install <arguments ansible-test passes>`` with the pip inside the wheel.
"""

from __future__ import annotations

import glob
import os
import sys

here = os.path.dirname(os.path.abspath(__file__))
version = os.path.splitext(os.path.basename(__file__))[0].removeprefix("get_pip_").replace("_", ".")
wheels = glob.glob(os.path.join(here, f"pip-{version}-py3-none-any.whl"))
if not wheels:
    sys.exit(f"pip {version} wheel missing beside {__file__}: run scripts/setup-python.sh")
sys.path.insert(0, wheels[0])

from pip._internal.cli.main import main

# get-pip's own switches, which `pip install` does not know: nothing else is to be installed anyway.
own_switches = {"--no-setuptools", "--no-wheel", "--no-pip"}
sys.exit(main(["install", *(arg for arg in sys.argv[1:] if arg not in own_switches)]))
