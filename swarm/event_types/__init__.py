"""One frozen dataclass per kind of event a peer emits (swarm.events.EventSink), grouped by the part that emits it.

Emitters build these and consumers (the heartbeats' progress, the metrics, the status view, the simulation and its
report) read them by attribute; only the JSON lines, for other programs, carry them as dicts.
"""

from swarm.event_types.base import Event
from swarm.event_types.network import (
    BootstrapGaveUp,
    BootstrapReconnected,
    BootstrapRetry,
    BootstrapUnreachable,
    ChatterFailed,
    Finished,
    GossipStats,
    Listening,
    MetricsListening,
    PeerGone,
    RoleFailed,
    Stalled,
    TrainerKeyGaveUp,
    Warned,
)
from swarm.event_types.policy import (
    Adopted,
    Complete,
    DhtFound,
    Dropped,
    Link,
    PeerDropped,
    Refused,
    Spare,
    TransferProgress,
)
from swarm.event_types.trainer import (
    Evaluated,
    Gate,
    NumberedPast,
    Published,
    PublishingEarly,
    Resumed,
    Trained,
    TrainerDevice,
    TrainerWaiting,
    TrainStep,
    ValidatorIgnored,
    WaitingForValidators,
    WorkerBanned,
)
from swarm.event_types.workers import (
    Generated,
    Generating,
    RejectedRollout,
    RewardRefused,
    Skipped,
    Validated,
    ValidatorDevice,
)

__all__ = [
    "Adopted", "BootstrapGaveUp", "BootstrapReconnected", "BootstrapRetry", "BootstrapUnreachable", "ChatterFailed",
    "Complete", "DhtFound", "Dropped", "Evaluated", "Event", "Finished", "Gate", "Generated", "Generating",
    "GossipStats", "Link", "Listening", "MetricsListening", "NumberedPast", "PeerDropped", "PeerGone", "Published",
    "PublishingEarly", "Refused", "RejectedRollout", "Resumed", "RewardRefused", "RoleFailed", "Skipped", "Spare",
    "Stalled", "TrainStep", "Trained", "TrainerDevice", "TrainerKeyGaveUp", "TrainerWaiting", "TransferProgress",
    "Validated", "ValidatorDevice", "ValidatorIgnored", "WaitingForValidators", "Warned", "WorkerBanned",
]
