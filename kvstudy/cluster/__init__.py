"""Several replicas behind a router (issue 37, started): kvstudy/cluster/routers.py."""
