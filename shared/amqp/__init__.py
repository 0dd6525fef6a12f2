"""RabbitMQ: connections and confirmed publishing (pika), the topology as data, pika's fast paths."""
