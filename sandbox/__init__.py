"""The sandbox cluster: a simulated GPU cluster the console can run against when no
real one is configured (its embedded default), and that the tests drive.

Plain Python: nothing here imports Django or the console's apps, so it can run in a
process of its own. ``sandbox.kubesim`` is the simulated Kubernetes cluster."""
