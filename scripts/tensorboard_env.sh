#!/usr/bin/env bash
# A Python virtual environment with TensorBoard (pinned, from PyPI), whose own event-file reader the tests read
# the metrics' event files with (tests/system/test_tensorboard.sh; reading scalars needs no TensorFlow). Prints
# the venv's python. scripts/test.sh makes it before the tests run; the test itself never installs.
#
#   scripts/tensorboard_env.sh [--no-install]   -> ${GRPO_TB_VENV:-~/.cache/grpo/tensorboard-venv}/bin/python
exec "$(dirname "$0")/venv_pin.sh" "${GRPO_TB_VENV:-$HOME/.cache/grpo/tensorboard-venv}" tensorboard==2.20.0 \
    tensorboard.backend.event_processing.event_accumulator "$@"
