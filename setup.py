"""Build step that pyproject.toml cannot say: a wheel carries the shipped configs.

The configs and sweep manifests live beside the package, in configs/ and experiments/, where
the docs and the commands name them. A wheel would leave them out, so an installed adalora
could not list or copy them (`adalora configs`); this copies both folders into the built
package as adalora_cli/_shipped/, where adalora_cli/resources.py looks first. An editable
install reads them from the source tree and needs no copy.
"""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
SHIPPED = ("configs", "experiments")  # as adalora_cli/resources.py: SHIPPED
WHEEL_COPY = "_shipped"              # as adalora_cli/resources.py: WHEEL_COPY


class BuildWithConfigs(build_py):
    def run(self) -> None:
        super().run()
        if self.editable_mode:
            return
        for folder in SHIPPED:
            target = Path(self.build_lib) / "adalora_cli" / WHEEL_COPY / folder
            shutil.rmtree(target, ignore_errors=True)
            shutil.copytree(HERE / folder, target,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))


setup(cmdclass={"build_py": BuildWithConfigs})
