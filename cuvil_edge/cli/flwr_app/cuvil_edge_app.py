"""Entry points for Flower's deployment engine: the apps of the cuvil-edge installed here."""

import cuvil_edge.agent.client_app
import cuvil_edge.coordinator.server_app

clientapp = cuvil_edge.agent.client_app.app
serverapp = cuvil_edge.coordinator.server_app.app
