"""The compiled readers of OpenJMS blobs, BizTalk context bags and JSON bodies' root `$type` (issue 49): built at install by the machine's C compiler through Cython.

`optional=True`: a machine without a compiler still installs qbridge, and the pure-Python
reader the compiled one is held to (bridge/codecs/openjms_fast.py) does the work, about 5x
slower; the first OpenJMS blob read then logs a WARNING that says so (bridge/codecs/openjms_blob.py).
"""

from Cython.Build import cythonize
from setuptools import Extension, setup

# biztalk_native inflates Parts' blocks with zlib's own C library (zlib.h from zlib1g-dev)
LIBRARIES = {"biztalk_native": ["z"]}

setup(ext_modules=cythonize(
    [Extension(f"bridge.codecs.{name}", [f"bridge/codecs/{name}.pyx"], libraries=LIBRARIES.get(name, []), optional=True)
     for name in ("openjms_native", "biztalk_native", "bodytype_native")],
    compiler_directives={"language_level": 3},
))
