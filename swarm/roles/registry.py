"""The role tasks a peer can run beside its networking (imported lazily: seed-only peers never load torch)."""

from swarm.roles.inference import inference_role
from swarm.roles.trainer import trainer_role
from swarm.roles.validator import validator_role

ROLE_TASKS = {"trainer": trainer_role, "inference": inference_role, "validator": validator_role}
