"""tbtest -- the helpers of the integration tests, one module per topic.

    env         the source tree, the build, test programs, ports, Redis
    apache      an Apache of our own; every apache2 run (scripts/apache2.sh)
    core        the tb_driver client, Redis keys and slots, the vectors
    shim        shim configs and environments, the test daemons and clients
    ha          Redis Sentinel and Redis Cluster rigs
    proof       haproxy, wrk, access-log windows, the ideal bucket, results
    load        small, bounded HTTP load from Python threads
    algo_model  the Python model of the algorithm scripts

tests/integration/conftest.py puts the directory holding this package on
sys.path and turns these helpers into fixtures; tests import the rest,
e.g. `from tbtest.env import Redis`.
"""
