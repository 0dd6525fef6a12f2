"""The one consumer loop every service uses (runtime.py: receive → handle on a thread → settle on
the connection's thread), and the values a service and the loop hand each other (deliveries.py).

Services and their tests import the loop's interface from here, wherever its parts live.
"""

from shared.consumer.connection_thread import POLL_S
from shared.consumer.deliveries import ConsumerHooks, Delivery, Handler, Outcome, StopEvent, Subscription
from shared.consumer.runtime import ConsumerRuntime, run_consumers

__all__ = [
    "POLL_S",
    "ConsumerHooks",
    "ConsumerRuntime",
    "Delivery",
    "Handler",
    "Outcome",
    "StopEvent",
    "Subscription",
    "run_consumers",
]
