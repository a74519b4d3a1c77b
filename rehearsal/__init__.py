"""What a cluster would build from our Flyte tasks, rebuilt on one machine for the tests and benchmarks that
cannot reach a cluster: the pods of the RL task's RayJob as local Ray nodes (rayjob_shape.py) and the RayJob /
PyTorchJob resources Flyte's backend plugins create from the serialized tasks (k8s_resources.py). Not imported
by the tasks or the library."""
