DROP TABLE diesel_service_orders;
