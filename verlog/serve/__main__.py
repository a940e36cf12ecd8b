"""``python -m verlog.serve {serve-model,serve} ...`` (the same commands as ``verlog serve-model`` / ``verlog serve``)."""

import sys

from verlog.serve.commands import main

sys.exit(main())
