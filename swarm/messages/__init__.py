"""The run's gossip messages: typed decoders for every body, and the codecs and transport of rollouts and votes."""
