"""Expert parallelism: the (data-parallel x expert-parallel) mesh, token dispatch, sharded experts."""
