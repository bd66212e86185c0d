"""`python -m keras_transformer.cli`: the keras-transformer command."""

import sys

from keras_transformer.cli.commands import main

sys.exit(main())
