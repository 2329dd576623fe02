"""`make reliability`: long attacks on the server and the pipeline (see `bench.reliability.run`)."""
