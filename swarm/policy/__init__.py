"""Policy versions of a run: who may sign them, what they carry, and the mirror that fetches and seeds them."""
