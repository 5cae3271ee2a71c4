#!/bin/bash
# A/B of copy to a local repository, cold cache: old (staged through the page cache)
# vs new (staged with O_DIRECT), alternating on the same kept bench source; the target
# is on the source's disk (copy-ab-target.sh with the scratch directory as its parent).
# Usage: copy-ab-direct.sh SCRATCH OLD_BINARY NEW_BINARY [ROUNDS]
exec "$(dirname "$0")/copy-ab-target.sh" "$1" "$1" "$2" "$3" "${4:-3}"
