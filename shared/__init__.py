"""Code shared by the producer, the workers and the dead-letter consumer."""
