# The fresh-machine rehearsal: see README.md ("A first run, rehearsed") and scripts/fresh-test.sh.
#   make fresh-test DRY_RUN=1                  the plan, computed for real; changes nothing
#   make fresh-test TASKHERD_FRESH_CONFIRM=yes stop the services and the cluster, purge what the
#                                              project installed, then make test and make demo from a
#                                              clean clone, with timings
# Options: FRESH_DIR=…, FRESH_CACHES=1, FRESH_KEEP=1, PRISTINE=… (documented in the script).
.PHONY: fresh-test

fresh-test:
	bash scripts/fresh-test.sh
