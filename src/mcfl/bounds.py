"""The former name of :mod:`mcfl.cost.memory` (the same module object: setting an attribute here sets
it there). New code imports :mod:`mcfl.cost.memory`."""

import sys

from mcfl.cost import memory

sys.modules[__name__] = memory
