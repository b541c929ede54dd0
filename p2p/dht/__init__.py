"""The Kademlia DHT: signed latest-manifest records, provider records and the lookup traversal as a pure function."""
