"""The floor: an ext_proc service on the same stack (``shared``) that decides nothing.

``python -m bench.noop_extproc --grpc-port P --grpc-health-port H``
"""

from __future__ import annotations

import asyncio

from shared.extproc import Exchange, ExtProcServicer
from shared.flags import Parser
from shared.server import ServeOptions, install_uvloop, serve


def main() -> None:
    p = Parser(prog="noop-extproc")
    p.add_argument("--grpc-port", type=int, required=True)
    p.add_argument("--grpc-health-port", type=int, required=True)
    args = p.parse_args()
    install_uvloop()
    servicer = ExtProcServicer(Exchange)
    opts = ServeOptions(grpc_port=args.grpc_port, health_port=args.grpc_health_port,
                        secure=False, host="127.0.0.1", grace=1)
    asyncio.run(serve(servicer, opts))


if __name__ == "__main__":
    main()
