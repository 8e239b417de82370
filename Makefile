# The commands of the README:  make lab       (run the pivot against the local lab)
#                              make test      (everything CI runs)
#                              make lab-down  (remove the labs' containers and networks)
.PHONY: setup setup-python setup-docker lab test lab-down

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

# Stops and removes the single-host lab (ct200, pro6000, network specdec-lab) and the fleet lab (fleet-a/b/c,
# fleet-lb, network specdec-fleet) that make lab and make test leave running; a second run has nothing to do.
lab-down:
	bash lab/down.sh
	bash lab/fleet/down.sh
