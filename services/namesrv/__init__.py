"""The TideMQ name server: RocketMQ 4.x compatible broker registry and topic routes.

Brokers register over remoting (REGISTER_BROKER every 30 s); clients ask for topic routes
(GET_ROUTEINFO_BY_TOPIC). State is in memory only; it is rebuilt from registrations after a restart.
"""

from tidemq.namesrv.config import NamesrvConfig
from tidemq.namesrv.routes import RouteInfoManager
from tidemq.namesrv.server import NamesrvServer

__all__ = ["NamesrvConfig", "NamesrvServer", "RouteInfoManager"]
