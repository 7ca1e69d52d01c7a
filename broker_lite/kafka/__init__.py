"""The Kafka wire listener (issue 31): Kafka clients produce to and fetch from llog."""
