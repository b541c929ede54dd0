"""The role tasks a peer can run beside its networking (imported lazily: seed-only peers never load torch); each
is given its typed context (swarm.node.context), not the node."""

from swarm.config import TrainerSettings
from swarm.node.context import role_part
from swarm.roles.inference import inference_role
from swarm.roles.trainer import trainer_role
from swarm.roles.validator import validator_role

ROLE_TASKS = {
    "trainer": role_part(trainer_role, lambda config: TrainerSettings(config.trainer, config.mirror.piece_kb)),
    "inference": role_part(inference_role, lambda config: config.inference),
    "validator": role_part(validator_role, lambda config: None),  # the [peer] section is all it reads
}
