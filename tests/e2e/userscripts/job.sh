#!/bin/sh
# A job that is not Python: run as is under --no-python; prints its rank and world size.
echo "shell rank=$RANK world=$WORLD_SIZE args=$*"
