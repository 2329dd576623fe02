"""Containers: `tfship deploy build|run|stop` (`deploy.cli`) over a typed layer on the Docker SDK (`deploy.engine`)."""
