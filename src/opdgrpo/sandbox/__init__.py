"""Running untrusted code: the isolation (:mod:`~opdgrpo.sandbox.isolation`: namespaces, cgroups, rlimits, a pool of
warm launchers), the checks a code reward runs through it (:mod:`~opdgrpo.sandbox.execution` for function tests,
:mod:`~opdgrpo.sandbox.stdio` for stdin/stdout programs), and the programs the sandbox starts
(:mod:`~opdgrpo.sandbox.programs`, sent as text).
"""
