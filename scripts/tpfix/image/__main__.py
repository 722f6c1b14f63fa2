# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM tpfix distribution
"""python -m tpfix.image: the image stage alone, from dist/ (tpfix.image.image)."""

from tpfix.core.util import main_wrapper
from tpfix.image.image import main

if __name__ == "__main__":
    main_wrapper(main)
