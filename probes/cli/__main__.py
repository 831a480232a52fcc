from probes.cli.main import main

raise SystemExit(main())
