"""One import name, `zfab`, for the repository's three folders: service/ installs as `zfab`, api/ as
`zfab.api` and apiclient/ as `zfab.apiclient`, so nothing named `service` or `api` lands in
site-packages to shadow (or be shadowed by) a user's own modules. Everything else is in pyproject.toml.
"""

from setuptools import find_namespace_packages, setup

# Namespace packages too: the console's data folders (static/, templates/) install with it.
FOLDERS = {"zfab": "service", "zfab.api": "api", "zfab.apiclient": "apiclient"}

setup(
    packages=[
        name + sub[len(folder) :]
        for name, folder in FOLDERS.items()
        for sub in find_namespace_packages(include=[folder, folder + ".*"], exclude=["*.__pycache__"])
    ],
    package_dir=FOLDERS,
)
