"""Print the ``opentelemetry-proto==<installed version>`` requirement, for the installers to
put that package's files back after ``xds-protos``.

``xds-protos`` (the Envoy protos the ext_proc services use) ships its own, older copy of the
``opentelemetry/proto/`` modules, into the same paths as ``opentelemetry-proto``; whichever is
installed last wins, and pip's order is not fixed. The older copy lacks messages the OTLP
exporter and ``devkit.otlp`` read (``InstrumentationScope``), so the Makefile and the
Dockerfile reinstall ``opentelemetry-proto`` (``--no-deps --force-reinstall``) after
everything else.
"""

from importlib.metadata import version

if __name__ == "__main__":
    print(f"opentelemetry-proto=={version('opentelemetry-proto')}")
