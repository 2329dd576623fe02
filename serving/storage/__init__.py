"""Model repositories in object stores (s3://): fsspec access, and the verified local mirror servers load from."""
