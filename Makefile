# The two commands of the README:  make lab   (run the pivot against the local lab)
#                                  make test  (everything CI runs)
.PHONY: setup setup-python setup-docker lab test

setup-python:
	bash scripts/setup-python.sh
	bash scripts/link-collection.sh

setup-docker:
	bash lab/setup-docker.sh

# both at once (scripts/setup.sh): the Python venvs and the lab image, each to its own log
setup:
	bash scripts/setup.sh

lab: setup
	bash lab/run-pivot.sh

test: setup
	bash scripts/test.sh
