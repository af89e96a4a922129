"""The JSON codec the client reads and writes bodies with, for code that keeps records as JSON
(the command line's files and databases): compact UTF-8, msgspec's and orjson's speed, and
every integer exact, those beyond 64 bits included (orjson alone would read them as floats and
refuse to write them).

- :func:`loads` decodes bytes or text; ``ValueError`` (only) for anything that is not JSON.
- :func:`dumps` encodes to bytes; a ``TypeError`` for what JSON cannot carry.
"""

from ._json import dumps, loads

__all__ = ["dumps", "loads"]
